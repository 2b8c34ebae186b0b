"""Direct measurements of the links between CPU cores, through shared memory.

The ``cpu`` backend's workers exchange shards through shared-memory files, so
the "host link" of a core is a copy through ``/dev/shm`` and a "peer link" is
the hand-off between two pinned processes. These functions time both with real
processes pinned to real cores (MEASURED); :mod:`lib.execution.characterise`
turns the figures into the profile's link records.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from multiprocessing import connection, get_context
from pathlib import Path

import numpy as np

from lib.execution.shm import place
from lib.platform.machines import Machine


def core_ids(machine: Machine) -> list[int]:
    cores = sorted(os.sched_getaffinity(0))
    return [cores[i % len(cores)] for i in range(machine.n)]


def shm_copy_seconds(nbytes: int, write_core: int, read_core: int,
                      repeats: int) -> tuple[float, float]:
    """(write seconds, read seconds), medians: a buffer written into a fresh
    shared-memory file mapping on one core, then copied out through a fresh
    mapping on another (page faults included, as a worker's are)."""
    saved = os.sched_getaffinity(0)
    src = np.frombuffer(np.random.default_rng(0).bytes(nbytes), dtype=np.uint8)
    writes, reads = [], []
    root = place(nbytes, "the characterisation's shared-memory copy")
    path = Path(root) / f"gpuhive-copy-{os.getpid()}.bin"
    try:
        for _ in range(repeats):
            os.sched_setaffinity(0, {write_core})
            t0 = time.perf_counter()
            mm = np.memmap(path, dtype=np.uint8, mode="w+", shape=(nbytes,))
            mm[:] = src
            mm.flush()
            del mm
            writes.append(time.perf_counter() - t0)
            os.sched_setaffinity(0, {read_core})
            t0 = time.perf_counter()
            mm = np.memmap(path, dtype=np.uint8, mode="r", shape=(nbytes,))
            out = np.array(mm)
            del mm
            reads.append(time.perf_counter() - t0)
            del out
            path.unlink()
    finally:
        os.sched_setaffinity(0, saved)
        path.unlink(missing_ok=True)
    return statistics.median(writes), statistics.median(reads)


def _echo_main(conn: connection.Connection) -> None:
    """Helper process: pin to a core on request, echo everything else."""
    while True:
        msg = conn.recv()
        if msg is None:
            return
        if isinstance(msg, tuple) and msg[0] == "pin":
            os.sched_setaffinity(0, {msg[1]})
        conn.send(msg)


def ping_pong_seconds(pairs: Sequence[tuple[int, int]],
                       repeats: int) -> dict[tuple[int, int], float]:
    """One-way pipe latency between processes pinned to each (core, core) pair:
    half the median round trip of a one-byte message."""
    ctx = get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_echo_main, args=(child,), daemon=True,
                       name="gpuhive-echo")
    saved = os.sched_getaffinity(0)
    out = {}
    try:
        proc.start()
        child.close()
        for a, b in pairs:
            os.sched_setaffinity(0, {a})
            parent.send(("pin", b))
            parent.recv()
            trips = []
            for _ in range(max(20, 20 * repeats)):
                t0 = time.perf_counter()
                parent.send(b"x")
                parent.recv()
                trips.append(time.perf_counter() - t0)
            out[(a, b)] = statistics.median(trips) / 2
        parent.send(None)
        proc.join(timeout=5)
    finally:
        os.sched_setaffinity(0, saved)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=2)
        parent.close()
    return out


