"""The C++ decision reader, ``kernels/gpuhive/decision.hpp``, agrees with Python.

``tests/cpp/decision_check.cpp`` is compiled once (the system C++ compiler,
``-Wall -Wextra -Wpedantic -Werror``) and fed every case in one batch. Over
decisions the policies write for all five kinds, four dtypes and four machines,
hand-made ones with awkward shares, the output of ``gpuhive explain --json``
and fuzzed numbers and share vectors, the C++ side must give exactly Python's
canonical text, ``config_hash`` and ``split_rows`` bounds; refuse what Python
refuses, naming the same field; refuse tampered decisions, naming both hashes.
``launch_example.cu`` must compile with ``nvcc -c`` (no GPU needed).

Needs a C++17 compiler (skips with the reason otherwise); the nvcc check skips
without nvcc.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shlex
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from lib.contract import (
    ContractError,
    Decision,
    TaskSpec,
    canonical_json,
    config_hash,
    decision_from_weights,
    expect_number,
    loads_strict,
)
from lib.platform.machines import load_machine
from lib.platform.workloads import split_rows
from lib.policies.registry import make_policy
from lib.security import check_decision

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "kernels" / "gpuhive" / "decision.hpp"
DRIVER = ROOT / "tests" / "cpp" / "decision_check.cpp"
EXAMPLE = ROOT / "kernels" / "gpuhive" / "launch_example.cu"
MACHINES = ("hetero-4", "local-cpu", "uni-server-2gpu-induced", "uni-server-1gpu")
DTYPES = ("fp16", "bf16", "fp32", "fp64")
SEP = "\x1f"


def _cxx() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


# ------------------------------------------------------------------ fixtures --


@pytest.fixture(scope="module")
def nvcc_build(tmp_path_factory):
    """``nvcc -c`` of launch_example.cu, started in the background (it runs
    while the other tests do): the Popen, the object path; None without nvcc."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    obj = tmp_path_factory.mktemp("nvcc") / "launch_example.o"
    proc = subprocess.Popen(
        [nvcc, "-std=c++17", "-c", str(EXAMPLE), "-o", str(obj)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield proc, obj
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def driver(tmp_path_factory, nvcc_build):
    """The compiled test driver: ``run(records) -> [fields of each line]``."""
    cxx = _cxx()
    if cxx is None:
        pytest.skip("no C++ compiler (g++, c++, clang++ or $CXX) on PATH")
    exe = tmp_path_factory.mktemp("cpp") / "decision_check"
    proc = subprocess.run(
        [cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
         str(DRIVER), "-o", str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

    def run(records: list[tuple[str, str | bytes]]) -> list[list[str]]:
        chunks = []
        for op, payload in records:
            data = payload.encode() if isinstance(payload, str) else payload
            chunks.append(f"{op} {len(data)}\n".encode() + data)
        out = subprocess.run([str(exe)], input=b"".join(chunks), capture_output=True,
                             check=True, timeout=60, cwd=ROOT).stdout.decode()
        lines = out.split("\n")[:-1]
        assert len(lines) == len(records)
        return [line.split("\t") for line in lines]

    return run


# ------------------------------------------------------------ Python's answer --


def _shards_py(task: TaskSpec, d: Decision) -> str:
    if len(d.gpus) != len(d.shares):
        return "ERR shares"
    try:
        bounds = split_rows(task.split_size, d.shares)
    except (ValueError, OverflowError):
        return "ERR shares"
    pieces = zip(d.gpus, bounds, strict=True)
    return ",".join(f"{g}:{lo}:{hi}" for g, (lo, hi) in pieces)


def _expected_pair(task: TaskSpec, d: Decision) -> list[str]:
    """What the driver must print for a valid pair, computed by Python."""
    digest = config_hash(task, d)
    if not d.config_hash:
        verify = "ERR config_hash|missing"
    elif digest == d.config_hash:
        verify = "ok"
    else:
        verify = "ERR config_hash|mismatch"
    return ["OK", digest, verify, _shards_py(task, d), canonical_json(task, d)]


def _head(result: str) -> str:
    """``ERR field|problem...`` cut to ``ERR field|word`` (``ok`` as is)."""
    return re.match(r"ok$|ERR [^|]*\|\w+", result).group(0)


def _compare_pairs(driver, pairs: list[tuple[TaskSpec, Decision, str, str]]):
    """``pairs``: (task, decision, task text, decision text) -> C++ agrees."""
    got = driver([("pair", t_text + SEP + d_text) for _, _, t_text, d_text in pairs])
    for (task, d, _, d_text), line in zip(pairs, got, strict=True):
        want = _expected_pair(task, d)
        assert line[0] == "OK", (d_text, line)
        shards = line[3].split("|")[0]
        assert [line[0], line[1], _head(line[2]), shards, line[5]] == want, d_text
    return got


def _policy_pairs() -> list[tuple[TaskSpec, Decision, str, str]]:
    tasks = []
    for dtype in DTYPES:
        tasks += [
            TaskSpec("matmul", {"M": 1000, "N": 777, "K": 333}, dtype),
            TaskSpec("reduce", {"N": 10**9 + 7}, dtype),
            TaskSpec("elementwise", {"N": 12345}, dtype),
            TaskSpec("stencil", {"H": 4097, "W": 1000, "T": 7}, dtype),
            TaskSpec("histogram", {"N": 2**31 - 1, "B": 4096}, dtype),
        ]
    policies = [make_policy(n) for n in ("proportional-peak", "equal", "single-best",
                                         "heft", "proportional-live", "rl")]
    policies += [make_policy("random", seed=s) for s in (0, 1, 7)]
    out = []
    for name in MACHINES:
        machine = load_machine(name)
        for task in tasks:
            for policy in policies:
                d = policy.decide(task, machine).with_hash(task)
                out.append((task, d, json.dumps(task.to_json()),
                            json.dumps(d.to_json())))
    return out


def _hand_made() -> list[tuple[TaskSpec, Decision]]:
    rng = random.Random(5)
    n7 = TaskSpec("elementwise", {"N": 7})
    big = TaskSpec("reduce", {"N": 2**31 - 1})
    mm = TaskSpec("matmul", {"M": 4097, "N": 8, "K": 3}, "bf16")
    st = TaskSpec("stencil", {"H": 3, "W": 3, "T": 1024}, "fp64")
    hist = TaskSpec("histogram", {"N": 99991, "B": 1}, "fp16")
    third = 1 / 3
    cases = [
        (n7, Decision((0, 1, 2), (third, third, third), 7)),
        (big, Decision((0, 1, 2), (third, third, 1 - 2 * third), 2**31 - 1)),
        (mm, Decision((0, 1, 2), (0.1, 0.2, 0.7), 4097, 1024, "pipelined", "p2p")),
        (mm, Decision((3, 0), (0.1 + 0.2, 1 - (0.1 + 0.2)), 17, 32, "split", "nccl")),
        (big, Decision((0, 1), (1e-300, 1.0 - 1e-300), 5)),
        (big, Decision((0, 1), (5e-324, 1.0), 5)),
        (big, Decision((2, 1), (1e-05, 1 - 1e-05), 5)),
        (st, Decision((0, 1, 2, 3), (0.25, 0.25, 0.25, 0.25), 3)),
        (st, Decision((0,), (1.0,), 3, 64, "single")),
        (hist, Decision((1, 0), (0.0, 1.0), 99991)),
        (hist, Decision((1, 0), (-0.0, 1.0), 99991)),           # hashes as -0.0
        (hist, Decision((0, 1), (2.0, 1.0), 99991)),            # normalised
        (n7, Decision(tuple(range(64)), (1 / 64,) * 64, 7)),     # 7 rows, 64 devices
        (big, Decision(tuple(range(64)), (1 / 64,) * 64, 2**31 - 1)),
        (big, Decision((0, 1), (1e16, 1.0), 1)),
        (big, Decision((0, 1), (123456789.125, 1e-7), 1)),
        (big, Decision((0, 1), (0.0, 0.0), 1)),                 # no positive sum
        (big, Decision((0, 1), (1.0,), 1)),                     # lengths differ
    ]
    for k in (3, 17, 63, 64):
        w = [rng.random() ** 4 for _ in range(k)]
        task = TaskSpec("elementwise", {"N": rng.randrange(1, 2**31)})
        cases.append((task, decision_from_weights(task, range(k), w)))
        w = [rng.choice([1e-17, 1e-300, 3.0, 1 / 7, 2.0**-40]) for _ in range(k)]
        cases.append((task, decision_from_weights(task, range(k), w)))
    return [(t, d.with_hash(t)) for t, d in cases]


# ------------------------------------------------------------- agreement --


def test_policy_decisions_agree_with_python(driver):
    """Every kind, dtype, machine and policy: hash, canonical text, rows."""
    pairs = _policy_pairs()
    got = _compare_pairs(driver, pairs)
    assert len(pairs) == 4 * 20 * 9
    # The decisions are varied: one to four devices, single and split (the
    # hand-made ones add pipelined, p2p, nccl and other block sizes).
    modes = {d.mode for _, d, _, _ in pairs}
    assert {"single", "split"} <= modes
    assert max(len(d.gpus) for _, d, _, _ in pairs) == 4
    assert all(line[2] == "ok" for line in got)


def test_hand_made_decisions_agree_with_python(driver):
    pairs = [(t, d, json.dumps(t.to_json()), json.dumps(d.to_json()))
             for t, d in _hand_made()]
    got = _compare_pairs(driver, pairs)
    by_text = {p[3]: line for p, line in zip(pairs, got, strict=True)}
    neg_zero = next(line for text, line in by_text.items() if "-0.0" in text)
    assert '"shares":[-0.0,1.0]' in neg_zero[5]
    assert neg_zero[4].startswith("ERR shares[0]|must be >= 0")  # Gate 1's check
    tiny = next(line for text, line in by_text.items() if "5e-324" in text)
    assert '"shares":[5e-324,1.0]' in tiny[5]
    # 7 rows over 64 equal shares: the first seven devices get one row each.
    seven = [line for p, line in zip(pairs, got, strict=True)
             if p[0].split_size == 7 and len(p[1].gpus) == 64][0]
    assert seven[3].split(",")[:8] == [f"{g}:{g}:{g + 1}" for g in range(7)] + ["7:7:7"]


def test_spellings_of_a_share_hash_alike(driver):
    """A share is hashed by value: 1, 1.0, 1e0, 10e-1, 0.1e1 and -0 are 1.0 or
    0.0; -0.0 stays -0.0; an integer share beyond 2**53 rounds as float()."""
    task = TaskSpec("reduce", {"N": 1000})
    base = ('{{"gpus": [0, 1], "shares": [{}, {}], "chunk": 1000, "block": 256, '
            '"mode": "split", "comm_path": "host"}}')
    spellings = [("1", "0"), ("1.0", "0.0"), ("1e0", "0e5"), ("10e-1", "-0"),
                 ("0.1E1", "0E-0"), ("1", "-0.0"), ("9007199254740993", "1"),
                 ("0.30000000000000004", "0.7"), ("1" + "0" * 300, "1e-400"),
                 ("3e-324", "2.4703282292062328e-324")]
    pairs = []
    for a, b in spellings:
        text = base.format(a, b)
        d = Decision.from_json(text)
        pairs.append((task, d, json.dumps(task.to_json()), text))
    got = _compare_pairs(driver, pairs)
    hashes = [line[1] for line in got]
    assert len(set(hashes[:5])) == 1                     # one share, one hash
    assert hashes[5] != hashes[0]                        # -0.0 is not 0.0
    assert '"shares":[9007199254740992.0,1.0]' in got[6][5]


def test_explain_output_is_read_as_it_is_printed(driver):
    """`gpuhive explain --json` output (indented, the decision nested with the
    task, prediction and optimum) read by parse_plan, parse_task and
    parse_decision."""
    runs = [("elementwise", ["N=1000003"], "fp16", "hetero-4", "proportional-peak"),
            ("matmul", ["M=999", "N=64", "K=32"], "fp32", "local-cpu", "equal")]
    records, expected = [], []
    for kind, dims, dtype, machine, policy in runs:
        cmd = [sys.executable, "-m", "lib", "explain", "--json", "--kind", kind,
               "--dtype", dtype, "--machine", machine, "--policy", policy]
        for dim in dims:
            cmd += ["--dim", dim]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                             cwd=ROOT).stdout
        doc = json.loads(out)
        task = TaskSpec.from_json(doc["task"])
        d = Decision.from_json(doc["decision"])
        assert "\n  " in out and "optimum_decision" in doc
        records += [("plan", out), ("pair", out + SEP + out)]
        expected.append((machine, policy, task, d))
    got = driver(records)
    for i, (machine, policy, task, d) in enumerate(expected):
        plan, pair = got[2 * i], got[2 * i + 1]
        want = _expected_pair(task, d)
        assert plan == ["OK", machine, policy, want[1], "ok", want[3]]
        assert pair[:4] == want[:4] and pair[5] == want[4]


def test_decide_runs_gpuhive_and_verifies(driver):
    """gpuhive::decide(task, machine, policy, program) builds the explain
    command, runs it with popen, parses and verifies its output; a command that
    fails is an error naming its exit status."""
    program = shlex.quote(sys.executable) + " -m lib"
    task = TaskSpec("stencil", {"H": 1001, "W": 64, "T": 3}, "fp64")
    bad = f"{program} explain --json --kind reduce --dim N=10 --machine nowhere-9 " \
          "2>/dev/null"
    got = driver([("decide_task", SEP.join([json.dumps(task.to_json()), "hetero-4",
                                            "heft", program])),
                  ("decide", bad)])
    d = make_policy("heft").decide(task, load_machine("hetero-4")).with_hash(task)
    assert got[0][:6] == ["OK", "hetero-4", "heft", d.config_hash, "ok",
                          _shards_py(task, d)]
    assert len(d.gpus) > 1
    assert shlex.split(got[0][6]) == [
        sys.executable, "-m", "lib", "explain", "--json", "--kind", "stencil",
        "--dim", "H=1001", "--dim", "W=64", "--dim", "T=3", "--dtype", "fp64",
        "--machine", "hetero-4", "--policy", "heft"]
    assert got[1][:2] == ["ERR", "decide"]
    assert got[1][2] == f"`{bad}` exited with status 2"


# ----------------------------------------------------------------- refusals --


def _tampered() -> list[tuple[TaskSpec, Decision, str]]:
    """(task the C++ side gets, decision as Python reads it, decision text)."""
    task = TaskSpec("matmul", {"M": 3000, "N": 64, "K": 64}, "fp16")
    d = make_policy("proportional-peak").decide(task, load_machine("hetero-4"))
    d = d.with_hash(task)
    good = d.to_json()
    out = []

    def add(t: TaskSpec, **change):
        obj = {**good, **change}
        out.append((t, Decision.from_json(obj), json.dumps(obj)))

    shares = list(good["shares"])
    add(task, shares=[math.nextafter(shares[0], 1.0)] + shares[1:])  # one ulp
    add(task, shares=[shares[1], shares[0]] + shares[2:])
    add(task, gpus=[good["gpus"][1], good["gpus"][0]] + good["gpus"][2:])
    add(task, block=512)
    add(task, mode="pipelined")
    add(task, chunk=good["chunk"] - 1)
    add(TaskSpec("matmul", {"M": 3001, "N": 64, "K": 64}, "fp16"))
    add(TaskSpec("matmul", {"M": 3000, "N": 64, "K": 64}, "bf16"))
    add(TaskSpec("matmul", {"M": 3000, "N": 64, "K": 65}, "fp16"))
    add(task, config_hash="0" * 64)
    add(task, config_hash="")
    return out


def test_tampered_decisions_are_refused_naming_both_hashes(driver):
    cases = _tampered()
    got = driver([("pair", json.dumps(t.to_json()) + SEP + text)
                  for t, _, text in cases])
    for (t, d, text), line in zip(cases, got, strict=True):
        assert line[0] == "OK", line           # well formed: parsed and hashed
        recomputed = config_hash(t, d)
        assert line[1] == recomputed
        if not d.config_hash:
            assert line[2] == "ERR config_hash|missing; the decision carries no " \
                              "hash to verify"
            continue
        assert line[2].startswith("ERR config_hash|mismatch"), text
        assert d.config_hash in line[2] and recomputed in line[2]
        assert d.config_hash != recomputed


def _python_outcome(task_text: str | bytes, decision_text: str | bytes) -> list[str]:
    try:
        task = TaskSpec.from_json(task_text)
        d = Decision.from_json(decision_text)
    except ContractError as exc:
        return ["ERR", exc.field, exc.problem]
    return ["OK", config_hash(task, d)]


TASK = '{"kind": "reduce", "dims": {"N": 100}, "dtype": "fp32", ' \
       '"divisible_dim": 0, "merge": "sum"}'
DEC = '{"gpus": [0, 1], "shares": [0.5, 0.5], "chunk": 100, "block": 256, ' \
      '"mode": "split", "comm_path": "host"}'


def _task(**change) -> str:
    obj = json.loads(TASK)
    obj.update(change)
    return json.dumps(obj)


def _dec(**change) -> str:
    obj = json.loads(DEC)
    obj.update(change)
    return json.dumps(obj)


#: (task text, decision text): malformed or borderline, one field each.
MALFORMED = [
    (TASK, DEC),
    (TASK, DEC[:-1]),                                   # truncated
    (TASK, DEC + " x"),                                 # extra data
    (TASK, DEC.replace('"chunk": 100', '"chunk": 1e2')),
    (TASK, DEC.replace('"chunk": 100', '"chunk": 100.0')),
    (TASK, DEC.replace("0.5, 0.5", "NaN, 0.5")),
    (TASK, DEC.replace("0.5, 0.5", "0.5, -Infinity")),
    (TASK, DEC.replace("0.5, 0.5", "1e400, 0.5")),
    (TASK, DEC.replace("0.5, 0.5", "1" + "0" * 309 + ", 0.5")),
    (TASK, DEC.replace("0.5, 0.5", "1" * 4301 + ", 0.5")),
    (TASK, DEC.replace("0.5, 0.5", '"0.5", 0.5')),
    (TASK, DEC.replace("0.5, 0.5", "true, 0.5")),
    (TASK, DEC.replace("0.5, 0.5", "[0.5], 0.5")),
    (TASK, DEC.replace("0.5, 0.5", "null, 0.5")),
    (TASK, DEC.replace('"gpus": [0, 1]', '"gpus": [0, 64]')),
    (TASK, DEC.replace('"gpus": [0, 1]', '"gpus": [0, -1]')),
    (TASK, DEC.replace('"gpus": [0, 1]', '"gpus": [0, true]')),
    (TASK, DEC.replace('"gpus": [0, 1]', '"gpus": []')),
    (TASK, DEC.replace('"gpus": [0, 1]', '"gpus": {"0": 1}')),
    (TASK, _dec(gpus=list(range(65)))),
    (TASK, _dec(gpus=[0, 10**40])),
    (TASK, _dec(gpus=[0, -(10**29)])),                # 30 digits: printed
    (TASK, _dec(gpus=[0, 10**4250])),                 # past 14000 bits: "about"
    (TASK, _dec(chunk=0)),
    (TASK, _dec(chunk=2**40 + 1)),
    (TASK, _dec(block=2**16 + 1)),
    (TASK, _dec(block=False)),
    (TASK, _dec(mode="parallel")),
    (TASK, _dec(mode=None)),
    (TASK, _dec(comm_path="HOST")),
    (TASK, _dec(config_hash="A" * 64)),
    (TASK, _dec(config_hash="a" * 63)),
    (TASK, _dec(config_hash=7)),
    (TASK, _dec(extra=1)),
    (TASK, DEC.replace('"block": 256, ', "")),
    (TASK, DEC.replace('"chunk": 100', '"chunk": 100, "chunk": 100')),
    (TASK, "[1, 2]"),
    (TASK, ""),
    (TASK, "{"),
    (TASK, '{"gpus": [0,]}'),
    (TASK, '{"gpus": [0] , \n }'),
    (TASK, '[1, 2 ,\t]'),
    (TASK, DEC.replace('"mode"', '"mo\\u0064e"')),      # escapes decode
    (TASK, DEC.replace('"split"', '"spl\\u0069t"')),
    (TASK, DEC.replace('"split"', '"split\\ud800"')),
    (TASK, DEC.replace('"split"', '"sp\x01lit"')),
    (TASK, DEC.replace('"split"', '"sp\\qlit"')),
    (TASK, "\ufeff" + DEC),
    (TASK, DEC.encode().replace(b"split", b"spl\xffit")),
    (TASK, "[" * 100 + "]" * 100),                     # deep, but a list
    (TASK, "[" * 100000 + "]" * 100000),               # too deep for both
    (_task(kind="sort"), DEC),
    (_task(kind=3), DEC),
    (_task(dims=[100]), DEC),
    (_task(dims={"N": 100, "M": 3}), DEC),
    (_task(dims={}), DEC),
    (_task(dims={"N": 0}), DEC),
    (_task(dims={"N": 2**31}), DEC),
    (_task(dims={"N": 100.0}), DEC),
    (_task(dims={"N": "100"}), DEC),
    (_task(dtype="fp8"), DEC),
    (_task(merge="concat"), DEC),
    (_task(merge=""), DEC),                             # falsy: the kind's merge
    (_task(merge=None), DEC),
    (_task(merge=0), DEC),
    (_task(merge=[]), DEC),
    (_task(merge=1), DEC),
    (_task(divisible_dim=1), DEC),
    (_task(divisible_dim=True), DEC),
    (_task(kind="stencil", dims={"H": 2, "W": 3, "T": 1}), DEC),
    (_task(kind="stencil", dims={"H": 3, "W": 3, "T": 1025}, merge="concat"), DEC),
    (_task(kind="histogram", dims={"N": 3, "B": 0}), DEC),
    (_task(kind="histogram", dims={"B": 9, "N": 3}), DEC),
    (_task(kind="matmul", dims={"M": 1, "N": 2, "K": 3}, merge=""), DEC),
    (TASK.replace('"sum"', '"sum", "x": 1'), DEC),
    (TASK.replace('"dtype": "fp32", ', ""), DEC),
    (TASK.replace('"N": 100', '"N": 100, "N": 100'), DEC),
    (TASK.replace('"fp32"', '"\\u0066p32"'), DEC),
]


#: The C++ reader words a trailing comma as Python 3.13's json does; older
#: Pythons say what they expected after it.
BEFORE_3_13 = {
    "not valid JSON: Illegal trailing comma before end of array":
        "not valid JSON: Expecting value",
    "not valid JSON: Illegal trailing comma before end of object":
        "not valid JSON: Expecting property name enclosed in double quotes",
}


def _as_this_python(message: str) -> str:
    """A C++ syntax message as the Python running the tests words it."""
    return BEFORE_3_13.get(message, message) if sys.version_info < (3, 13) \
        else message


def test_malformed_input_is_refused_naming_the_field_python_names(driver):
    """The C++ reader accepts what Python accepts (with the same hash) and
    refuses what it refuses, naming the same field with the same message
    (for JSON syntax errors, the same field: Python's messages there carry
    its own character positions)."""
    records = [("pair", (t.encode() if isinstance(t, str) else t) + SEP.encode()
                + (d.encode() if isinstance(d, str) else d)) for t, d in MALFORMED]
    got = driver(records)
    refused = 0
    for (t, d), line in zip(MALFORMED, got, strict=True):
        want = _python_outcome(t, d)
        assert line[0] == want[0], (d, line, want)
        if want[0] == "OK":
            assert line[1] == want[1], d
            continue
        refused += 1
        assert line[1] == want[1], (t, d, line, want)
        if " at line " in want[2]:  # JSON syntax: Python's own positions follow
            assert _as_this_python(line[2].split(" at line ")[0]) == \
                want[2].split(" at line ")[0]
            continue
        if "codec can't decode" in want[2]:
            assert line[2].startswith("not valid UTF-8")
            continue
        assert line[2] == want[2], (t, d)
    assert refused >= 60


def test_envelope_and_bare_objects_are_both_read(driver):
    """parse_decision / parse_task take the bare object or one nested as
    "decision" / "task"; a bare object is never taken for an envelope."""
    env = json.dumps({"task": json.loads(TASK), "decision": json.loads(DEC),
                      "other": [1.5, {"x": None}]})
    got = driver([("decision", env), ("task", env), ("decision", DEC),
                  ("decision", _dec(decision={})), ("task", _task(task={})),
                  ("plan", DEC)])
    assert got[0] == got[2] == ["OK", json.dumps(
        json.loads(DEC) | {"config_hash": ""}, separators=(",", ":"))]
    assert got[1] == ["OK", json.dumps(json.loads(TASK), separators=(",", ":"))]
    assert got[3] == ["ERR", "decision.decision", "unknown field"]
    assert got[4] == ["ERR", "task.task", "unknown field"]
    assert got[5] == ["ERR", "task", "missing from the plan"]


def test_contract_checks_agree_with_gate_1(driver):
    """check_contract refuses exactly what Gate 1's contract.* checks refuse
    (those that need no machine), naming the share, gpus or mode."""
    task = TaskSpec("reduce", {"N": 1000})
    machine = load_machine("hetero-4")
    decisions = [
        Decision((0, 1), (0.5, 0.5), 1000),
        Decision((0, 1), (0.5, 0.5 + 2e-9), 1000),
        Decision((0, 1), (0.5, 0.5 + 5e-10), 1000),
        Decision((0, 1), (1.5, -0.5), 1000),
        Decision((0, 1), (1.0, -0.0), 1000),
        Decision((0, 1, 2), (0.5, 0.5), 1000),
        Decision((1, 1), (0.5, 0.5), 1000),
        Decision((0, 1), (0.5, 0.5), 1000, mode="single"),
        Decision((3,), (1.0,), 1000, mode="single"),
    ]
    field_of = {"contract.length": "shares", "contract.share_sum": "shares",
                "contract.duplicate_device": "gpus", "contract.single_mode": "mode"}
    got = driver([("pair", json.dumps(task.to_json()) + SEP
                   + json.dumps(d.with_hash(task).to_json())) for d in decisions])
    for d, line in zip(decisions, got, strict=True):
        verdict = check_decision(d.with_hash(task), task, machine)
        found = [v for v in verdict.violations if v.check.startswith("contract.")]
        if not found:
            assert line[4] == "ok", d
            continue
        first = found[0]
        want = field_of.get(first.check) or first.message.split(":")[0]
        assert line[4].startswith(f"ERR {want}|"), (d, line[4], first)


# ------------------------------------------------------------ number fuzzing --


def _bits(x: float) -> str:
    return f'{struct.unpack("<Q", struct.pack("<d", x))[0]:016x}'


def test_float_repr_matches_python(driver):
    rng = random.Random(11)
    values = [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308,
              1.7976931348623157e308, 1e16, 1e15, 9999999999999998.0, 1e-4, 1e-5, 0.1,
              1 / 3, 2 / 3, 1e22, 1e23, 123456789012345678.0, 0.30000000000000004]
    values += [2.0**e for e in range(-1074, 1024, 7)]
    while len(values) < 20000:
        x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if math.isfinite(x):
            values.append(x)
    values += [rng.random() for _ in range(3000)] + [k / 7 for k in range(1, 2000)]
    got = driver([("repr", " ".join(_bits(x) for x in values))])[0]
    assert got[0] == "OK"
    reprs = got[1].split(" ")
    assert len(reprs) == len(values)
    bad = [(x, r) for x, r in zip(values, reprs, strict=True) if repr(x) != r]
    assert not bad, bad[:5]


def test_number_reading_matches_python(driver):
    """JSON number texts read as a share: the same double (bit for bit) and
    repr as Python, or the same refusal."""
    rng = random.Random(3)
    texts = ["0", "-0", "-0.0", "1", "1e308", "1.8e308", "1e-400", "-1e-400",
             "2.4703282292062327e-324", "2.4703282292062328e-324", "4.9e-324",
             "179769313486231580793728971405303415079934132710037826936173778980444968"
             "2927647509466490179775872070963302864166928879109465555478519404026306574"
             "8867150582068190890200070838367627385484581771153176447573027006985557136"
             "6959622842914819860834936475292719074168444365510704342711559699508093042"
             "880177904174497791",
             "9007199254740993", "9007199254740993.0", "0.1e1", "123456789e-9"]
    for _ in range(3000):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 25)))
        digits = digits.lstrip("0") or "0"
        form = rng.randrange(3)
        if form == 0:
            texts.append(digits)
        elif form == 1:
            texts.append(f"{digits[0]}.{digits[1:] or '0'}e{rng.randrange(-330, 310)}")
        else:  # halfway and near-halfway between neighbouring doubles
            x = rng.random() * 10.0 ** rng.randrange(-300, 300)
            mid = (x + math.nextafter(x, math.inf)) / 2
            texts.append(f"{mid:.25e}")
            texts.append(repr(x) + rng.choice(["5", "50000000000001", "4999999999"]))
    got = driver([("num", t) for t in texts])
    for text, line in zip(texts, got, strict=True):
        try:
            x = expect_number(loads_strict(text), "share")
        except ContractError as exc:
            assert line[:2] == ["ERR", "share"], text
            assert line[2] == exc.problem, text
            continue
        assert line == ["OK", _bits(x), repr(x)], text


def test_split_rows_matches_python(driver):
    """Random sizes and share vectors, awkward ones included: the same bounds,
    or both refuse (no positive sum, a negative share, an overflowing sum)."""
    rng = random.Random(17)
    cases = [(7, [1 / 3] * 3), (10, [0.1] * 10), (1, [1e-300, 1e-300]),
             (2**31 - 1, [1e308, 1e308]), (5, [0.0, 0.0]), (5, [-1e-9, 1.0]),
             (5, [-0.0, 1.0]), (0, [0.5, 0.5]), (3, [5e-324, 5e-324, 1e-323]),
             # n * s / total rounds apart from n * (s / total) here:
             (45, [1 / 7, 9 / 7]), (36, [1.0, 5 / 3]), (48, [1 / 3, 3 / 7, 2 / 3]),
             (41, [3 / 7, 3 / 7, 9.0, 6 / 7, 1.0])]
    for _ in range(1000):  # small rational weights, not normalised
        n = rng.randrange(1, 50)
        cases.append((n, [rng.randrange(1, 10) / rng.randrange(1, 10)
                          for _ in range(rng.randrange(2, 6))]))
    for _ in range(2000):
        k = rng.randrange(1, 65)
        n = rng.choice([rng.randrange(0, 100), rng.randrange(0, 2**31), 2**31 - 1])
        kind = rng.randrange(4)
        if kind == 0:
            shares = [rng.random() for _ in range(k)]
        elif kind == 1:
            shares = [rng.choice([0.0, 1e-300, 1 / 3, 0.1, 2.0**-60, 1.0, 7.0])
                      for _ in range(k)]
        elif kind == 2:
            w = [rng.random() ** 8 for _ in range(k)]
            total = math.fsum(w) or 1.0
            shares = [x / total for x in w]
        else:
            shares = [rng.randrange(0, 5) / rng.randrange(1, 9) for _ in range(k)]
        cases.append((n, shares))
    got = driver([("split", f"{n} " + " ".join(_bits(s) for s in shares))
                  for n, shares in cases])
    for (n, shares), line in zip(cases, got, strict=True):
        try:
            want = split_rows(n, shares)
        except (ValueError, OverflowError):
            assert line[:2] == ["ERR", "shares"], (n, shares, line)
            continue
        assert line == ["OK", ",".join(f"{lo}-{hi}" for lo, hi in want)], (n, shares)


# ----------------------------------------------------------------- CUDA example --


def test_launch_example_compiles_with_nvcc(nvcc_build):
    if nvcc_build is None:
        pytest.skip("nvcc not on PATH")
    proc, obj = nvcc_build
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert obj.stat().st_size > 0
    nm = shutil.which("nm")
    if nm:
        symbols = subprocess.run([nm, "-C", str(obj)], capture_output=True,
                                 text=True).stdout
        assert " T main" in symbols
        assert "elementwise_fp32" in symbols
