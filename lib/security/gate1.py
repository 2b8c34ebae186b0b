"""Gate 1: is this decision valid, and feasible on this machine?

Gate 1 never trusts the policy. It takes anything (a :class:`Decision`, a
decoded JSON object, JSON text, or garbage), never raises, and returns a
:class:`~lib.security.verdict.Verdict` listing every violated check:

=========================  ==================================================
check id                   what it refuses
=========================  ==================================================
form.json                  text that is not strict JSON (NaN, duplicates...)
form.object                something that is not a decision object at all
form.unknown_field         a field the contract does not define
form.missing_field         a required field that is absent
form.type                  a wrong type (a string for a number, a dict...)
form.bool                  a bool where a number is due
form.float_as_int          a float where an integer is due
form.nonfinite             NaN or infinity
form.size                  lists or numbers outside the contract's bounds
contract.length            as many shares as gpus
contract.negative_share    shares are non-negative (-0.0 too: its sign bit is
                           set, and it would hash apart from 0 and 0.0)
contract.share_sum         shares sum to 1 within 1e-9 (math.fsum)
contract.duplicate_device  a device listed twice
contract.mode              mode one of single, split, pipelined
contract.comm_path         comm_path one of host, p2p, nccl
contract.single_mode       single mode means exactly one device
feasibility.task           the task is not a valid TaskSpec
feasibility.device         a device index the machine does not have
feasibility.unhealthy      a device telemetry marks unhealthy
feasibility.memory         a shard (inputs, outputs) exceeds free memory
                           less the margin
feasibility.block          block not a multiple of 32 in [32, 1024], or over
                           the device's limit
feasibility.chunk          chunk outside [1, size of the divisible dimension]
feasibility.chunk_count    pipelined: a shard cut into more than
                           MAX_CHUNKS_PER_SHARD (4096) chunks, or more than
                           MAX_PIPELINE_LAUNCHES (16384) chunks over all shards
feasibility.p2p            p2p between devices without a peer link
feasibility.nccl           nccl with fewer than two devices or without NCCL
integrity.missing_hash     no config_hash
integrity.hash_mismatch    config_hash differs from the recomputed one
=========================  ==================================================

The chunk-count bound caps the work one decision can create: in ``pipelined``
mode each shard of ``r`` rows runs as ``ceil(r / chunk)`` chunks, each a copy
in, a launch and a copy out, so ``chunk=1`` on 2**31 - 1 rows would ask for two
billion launches. The bound is far above what any policy asks for: the optimum
and the learned policy cut the largest shard into ``max(PIPELINE_CHUNKS)`` (64)
chunks at most (one more where their row count and Gate 1's differ by a
row), about 64 x 64 = 4096 in all on the contract's largest machine
(``MAX_DEVICES``); ``tests/test_gate1.py`` holds the bound to that. In
``single`` and ``split`` mode a shard is one launch whatever ``chunk`` says, so
the bound does not apply.

Numbers are checked by value: a share written ``1`` is the share ``1.0``, and
hashes the same (see :mod:`lib.contract`).
"""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Mapping
from typing import Any

from lib.contract import (
    COMM_PATHS,
    DECISION_FIELDS,
    MAX_BLOCK,
    MAX_CHUNK,
    MAX_DEVICES,
    MODES,
    ContractError,
    Decision,
    TaskSpec,
    config_hash,
    loads_strict,
    shown,
)
from lib.platform.machines import Machine
from lib.platform.telemetry import Snapshot
from lib.platform.workloads import split_rows, whole_work, workload
from lib.security.verdict import Verdict, Violation

#: Fraction of free memory a shard may not use (allocator slack, fragmentation).
MEMORY_MARGIN = 0.10
SHARE_SUM_TOL = 1e-9
#: Pipelined mode: most chunks one shard may be cut into.
MAX_CHUNKS_PER_SHARD = 4096
#: Pipelined mode: most chunks (each one launch) over all shards of a decision.
MAX_PIPELINE_LAUNCHES = 16384


def _int_problem(value: Any) -> tuple[str, str] | None:
    if isinstance(value, bool):
        return "form.bool", f"expected an integer, got bool {value!r}"
    if isinstance(value, float):
        return "form.float_as_int", f"expected an integer, got float {value!r}"
    if not isinstance(value, int):
        return "form.type", f"expected an integer, got {type(value).__name__}"
    return None


def _number_problem(value: Any) -> tuple[str, str] | None:
    if isinstance(value, bool):
        return "form.bool", f"expected a number, got bool {value!r}"
    if not isinstance(value, (int, float)):
        return "form.type", f"expected a number, got {type(value).__name__}"
    if isinstance(value, float) and not math.isfinite(value):
        return "form.nonfinite", f"must be finite, got {value!r}"
    if isinstance(value, int):
        try:
            float(value)
        except OverflowError:
            return "form.nonfinite", (f"must be finite, got {shown(value)} "
                                      "(beyond the range of a double)")
    return None


def _as_fields(decision: Any, out: list[Violation]) -> dict[str, Any] | None:
    """The decision's fields as a dict, or None (with violations) if unusable."""
    if type(decision) is Decision:  # a frozen dataclass: its fields only
        return dict(decision.__dict__)
    if isinstance(decision, Decision):
        return {f: getattr(decision, f) for f in DECISION_FIELDS}
    if isinstance(decision, (str, bytes)):
        try:
            decision = loads_strict(decision)
        except ContractError as exc:
            out.append(Violation("form.json", str(exc)))
            return None
    if not isinstance(decision, Mapping):
        out.append(Violation("form.object", "expected a decision object, got "
                                            f"{type(decision).__name__}"))
        return None
    fields = dict(decision)
    for key in fields:
        if key not in DECISION_FIELDS:
            out.append(Violation("form.unknown_field", f"{key!s:.40}: unknown field"))
    for key in DECISION_FIELDS[:-1]:
        if key not in fields:
            out.append(Violation("form.missing_field", f"{key}: missing field"))
    return fields


def _plain_lists(gpus: Any, shares: Any) -> bool:
    """Whether ``gpus`` and ``shares`` are lists or tuples of 1 to
    :data:`MAX_DEVICES` ints in ``[0, MAX_DEVICES)`` and finite floats:
    the form every policy writes, which :func:`_check_form` then need not
    look at item by item."""
    isfinite = math.isfinite
    return (type(gpus) in (tuple, list) and type(shares) in (tuple, list)
            and 1 <= len(gpus) <= MAX_DEVICES and 1 <= len(shares) <= MAX_DEVICES
            and all([type(g) is int and 0 <= g < MAX_DEVICES for g in gpus])
            and all([type(x) is float and isfinite(x) for x in shares]))


def _check_form(f: dict[str, Any], out: list[Violation]) -> bool:
    """Types and bounds; returns whether the fields are usable further on."""
    ok = True
    if _plain_lists(f.get("gpus"), f.get("shares")):
        lists: tuple[str, ...] = ()  # what a policy writes: nothing to report
    else:
        lists = ("gpus", "shares")
    for name in lists:
        value = f.get(name)
        if name not in f:
            ok = False
            continue
        if not isinstance(value, (list, tuple)):
            out.append(Violation("form.type", f"{name}: expected a list, got "
                                              f"{type(value).__name__}"))
            ok = False
            continue
        if not 1 <= len(value) <= MAX_DEVICES:
            out.append(Violation(
                "form.size",
                f"{name}: must hold 1 to {MAX_DEVICES} entries, got {len(value)}"))
            ok = False
        check = _int_problem if name == "gpus" else _number_problem
        plain = int if name == "gpus" else float
        for i, item in enumerate(value[:MAX_DEVICES]):
            if type(item) is plain and (plain is int or math.isfinite(item)):
                problem = None  # what a policy writes: skip the calls
            else:
                problem = check(item)
            if problem:
                out.append(Violation(problem[0], f"{name}[{i}]: {problem[1]}"))
                ok = False
            elif name == "gpus" and not 0 <= item < MAX_DEVICES:
                out.append(Violation(
                    "form.size",
                    f"gpus[{i}]: must be in [0, {MAX_DEVICES - 1}], got "
                    f"{shown(item)}"))
                ok = False
    for name, high in (("chunk", MAX_CHUNK), ("block", MAX_BLOCK)):
        if name not in f:
            ok = False
            continue
        if type(f[name]) is int and 1 <= f[name] <= high:
            continue  # what a policy writes
        problem = _int_problem(f[name])
        if problem:
            out.append(Violation(problem[0], f"{name}: {problem[1]}"))
            ok = False
        elif not 1 <= f[name] <= high:
            out.append(Violation("form.size", f"{name}: must be in [1, {high}], "
                                              f"got {shown(f[name])}"))
            ok = False
    for name, choices, check in (("mode", MODES, "contract.mode"),
                                 ("comm_path", COMM_PATHS, "contract.comm_path")):
        if name not in f:
            ok = False
        elif not isinstance(f[name], str):
            out.append(Violation("form.type", f"{name}: expected a string, got "
                                              f"{type(f[name]).__name__}"))
            ok = False
        elif f[name] not in choices:
            out.append(Violation(check, f"{name}: {f[name]!r:.40} is not one of "
                                        f"{', '.join(choices)}"))
            ok = False
    digest = f.get("config_hash", "")
    if not isinstance(digest, str):
        out.append(Violation("form.type", "config_hash: expected a string, got "
                                          f"{type(digest).__name__}"))
        ok = False
    return ok


def _check_contract(f: dict[str, Any], out: list[Violation]) -> bool:
    gpus, shares = list(f["gpus"]), [float(s) for s in f["shares"]]
    ok = True
    if len(gpus) != len(shares):
        out.append(Violation("contract.length", f"{len(gpus)} gpus but "
                                                f"{len(shares)} shares"))
        ok = False
    for i, s in enumerate(shares if min(shares) <= 0 else ()):
        if s < 0 or math.copysign(1.0, s) < 0:
            why = "" if s < 0 else " (negative zero hashes apart from 0 and 0.0)"
            out.append(Violation("contract.negative_share",
                                 f"shares[{i}]: must be >= 0, got {s}{why}"))
            ok = False
    total = math.fsum(shares)
    if abs(total - 1.0) > SHARE_SUM_TOL:
        out.append(Violation("contract.share_sum", f"shares sum to {total!r}, not 1 "
                                                   f"(tolerance {SHARE_SUM_TOL})"))
        ok = False
    seen: set[int] = set()
    for g in gpus if len(set(gpus)) < len(gpus) else ():
        if g in seen:
            out.append(Violation("contract.duplicate_device",
                                 f"device {g} is listed twice"))
            ok = False
        seen.add(g)
    if f["mode"] == "single" and len(gpus) != 1:
        out.append(Violation("contract.single_mode", f"single mode needs exactly one "
                                                     f"device, got {len(gpus)}"))
    return ok


def _check_feasibility(f: dict[str, Any], task: TaskSpec, machine: Machine,
                       telemetry: Snapshot | None, nccl: bool,
                       out: list[Violation]) -> None:
    gpus, shares = list(f["gpus"]), list(f["shares"])
    present = True
    for g in gpus:
        if g >= machine.n:
            out.append(Violation("feasibility.device", f"device {g} does not exist on "
                                                       f"{machine.name} "
                                                       f"({machine.n} devices)"))
            present = False
        elif telemetry is not None and not telemetry.healthy[g]:
            why = telemetry.unhealthy_why[g] if telemetry.unhealthy_why else ""
            out.append(Violation("feasibility.unhealthy",
                                 f"device {machine.devices[g].label} is unhealthy"
                                 + (f": {why}" if why else "")))
    block = f["block"]
    if block % 32 or not 32 <= block <= 1024:
        out.append(Violation("feasibility.block", f"block {block} must be a multiple "
                                                  f"of 32 in [32, 1024]"))
    elif present:
        for g in gpus:
            if block > machine.devices[g].max_block:
                out.append(Violation("feasibility.block", f"block {block} exceeds "
                                     f"device {machine.devices[g].label}'s limit "
                                     f"{machine.devices[g].max_block}"))
    if not 1 <= f["chunk"] <= task.split_size:
        out.append(Violation("feasibility.chunk", f"chunk {f['chunk']} must be in "
                                                  f"[1, {task.split_size}] "
                                                  f"({task.split_name})"))
    if f["mode"] == "pipelined":
        _check_chunk_count(f, task, out)
    if not present:
        return
    if f["comm_path"] == "p2p":
        for a in gpus:
            for b in gpus:
                link = machine.peer(a, b) if a < b else None
                if a < b and (link is None or not link.p2p):
                    why = "no peer link" if link is None else \
                        f"the {link.kind} link does not copy peer to peer"
                    out.append(Violation("feasibility.p2p", f"{why} between "
                                                            f"devices {a} and {b}"))
    if f["comm_path"] == "nccl":
        if len(gpus) < 2:
            out.append(Violation("feasibility.nccl", "nccl needs two or more devices"))
        if not nccl:
            out.append(Violation("feasibility.nccl", f"NCCL is not available on "
                                                     f"{machine.name}"))
    if len(gpus) != len(shares) or not shares or min(shares) < 0 \
            or math.fsum(shares) <= 0:
        return
    # No shard needs more than the whole task (a shard's footprint never
    # exceeds the footprint of all the rows; tests/test_gate1.py holds every
    # workload to it), so a task that fits whole on each device needs no cuts.
    whole = whole_work(task).footprint
    keep = 1.0 - MEMORY_MARGIN
    if telemetry is not None:
        free = telemetry.free_bytes
        if all([whole <= free[g] * keep for g in gpus]):
            return
    elif all([whole <= machine.devices[g].mem_bytes * keep for g in gpus]):
        return
    w = workload(task)
    for pos, (g, (lo, hi)) in enumerate(zip(gpus, split_rows(task.split_size, shares),
                                            strict=True)):
        need = w.work(task, hi - lo).footprint
        dev = machine.devices[g]
        free = telemetry.free_bytes[g] if telemetry is not None else dev.mem_bytes
        if need > free * (1.0 - MEMORY_MARGIN):
            out.append(Violation(
                "feasibility.memory",
                f"device {dev.label} cannot hold shard {pos}: needs "
                f"{need / 1e9:.2f} GB, has {free / 1e9:.2f} GB free "
                f"({MEMORY_MARGIN:.0%} margin)"))


def _check_chunk_count(f: dict[str, Any], task: TaskSpec,
                       out: list[Violation]) -> None:
    """Pipelined mode: chunks per shard and in all within the bounds."""
    gpus, shares, chunk = f["gpus"], f["shares"], f["chunk"]
    n = task.split_size
    whole = -(-n // chunk)  # chunks of the whole dimension
    # No shard has more chunks than the whole, and all shards together have
    # fewer than whole + one per shard: most decisions stop here.
    if whole <= MAX_CHUNKS_PER_SHARD and whole + len(gpus) <= MAX_PIPELINE_LAUNCHES:
        return
    if len(gpus) != len(shares) or any(s < 0 for s in shares) \
            or math.fsum(shares) <= 0:
        return  # no split to count (the contract checks name why)
    counts = [-(-(hi - lo) // chunk) for lo, hi in split_rows(n, shares)]
    worst = max(range(len(counts)), key=counts.__getitem__)
    if counts[worst] > MAX_CHUNKS_PER_SHARD:
        out.append(Violation(
            "feasibility.chunk_count",
            f"chunk {chunk} cuts shard {worst} into {counts[worst]} pipelined "
            f"chunks; at most {MAX_CHUNKS_PER_SHARD} per shard"))
    elif sum(counts) > MAX_PIPELINE_LAUNCHES:
        out.append(Violation(
            "feasibility.chunk_count",
            f"chunk {chunk} makes {sum(counts)} pipelined chunk launches over "
            f"{len(counts)} shards; at most {MAX_PIPELINE_LAUNCHES} in all"))


def _check_integrity(f: dict[str, Any], task: TaskSpec, out: list[Violation],
                     decision: Decision | None = None) -> None:
    """The hash recomputed from the fields (``decision``: the Decision they
    were read from, hashed as it is, since the hash ignores ``config_hash``)."""
    digest = f.get("config_hash", "")
    if not digest:
        out.append(Violation("integrity.missing_hash",
                             "config_hash is missing; compute it with "
                             "Decision.with_hash(task)"))
        return
    if decision is None:
        decision = Decision(gpus=tuple(f["gpus"]), shares=tuple(f["shares"]),
                            chunk=f["chunk"], block=f["block"], mode=f["mode"],
                            comm_path=f["comm_path"])
    expected = config_hash(task, decision)
    if not hmac.compare_digest(expected.encode(), digest.encode("utf-8", "replace")):
        out.append(Violation("integrity.hash_mismatch",
                             "config_hash does not match the task and decision"))


def check_decision(decision: Any, task: Any, machine: Machine,
                   telemetry: Snapshot | None = None, *,
                   nccl_available: bool | None = None) -> Verdict:
    """Gate 1: every violated check of ``decision`` for ``task`` on ``machine``.

    Args:
        decision: a Decision, a decoded JSON object, or JSON text (untrusted).
        task: the TaskSpec the decision is for.
        machine: the machine profile.
        telemetry: live state; when given, unhealthy devices are refused and
            memory is checked against free rather than total memory.
        nccl_available: whether NCCL can be used; default the machine's flag.

    Returns:
        A Verdict (gate ``"gate1"``); never raises.
    """
    start = time.perf_counter()
    out: list[Violation] = []
    try:
        fields = _as_fields(decision, out)
        if fields is not None and _check_form(fields, out):
            contract_ok = _check_contract(fields, out)
            if not isinstance(task, TaskSpec):
                out.append(Violation("feasibility.task", "expected a TaskSpec, got "
                                                         f"{type(task).__name__}"))
            else:
                nccl = machine.nccl if nccl_available is None else nccl_available
                _check_feasibility(fields, task, machine, telemetry, nccl, out)
                if contract_ok:
                    _check_integrity(fields, task, out, decision
                                     if type(decision) is Decision else None)
    except Exception as exc:  # a gate reports; it never raises
        out.append(Violation("form.object", f"unusable decision "
                                            f"({type(exc).__name__}: {exc})"))
    return Verdict(gate="gate1", violations=tuple(out),
                   seconds=time.perf_counter() - start)
