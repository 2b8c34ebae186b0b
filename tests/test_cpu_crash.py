"""A crash leaves nothing behind: killing ``gpuhive``'s process with SIGKILL
mid-run takes its workers with it, and the next cpu backend to start removes
the shared-memory buffers the dead run left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lib.execution.cpu import CpuBackend
from lib.execution.shm import _alive, reclaim_orphans, shm_root
from lib.platform.machines import load_machine

pytestmark = [pytest.mark.serial,
              pytest.mark.skipif(not hasattr(os, "sched_getaffinity"),
                                 reason="the cpu backend pins workers (Linux only)")]

#: A run long enough to be killed in the middle of (a few seconds per shard).
VICTIM = """
import sys
from lib.contract import TaskSpec, decision_from_weights
from lib.execution.cpu import CpuBackend
from lib.platform.machines import load_machine

machine = load_machine("local-cpu")
backend = CpuBackend(machine, repeats=50)
backend.start()
print(" ".join(str(p.pid) for p in backend.workers), flush=True)
task = TaskSpec("matmul", {"M": 1400, "N": 1400, "K": 1400})
decision = decision_from_weights(task, range(machine.n), [1.0] * machine.n)
print("running", flush=True)
backend.run(task, decision.with_hash(task))
"""


def _gone(pids: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def _ours(pid: int) -> list[Path]:
    return sorted(Path(shm_root()).glob(f"gpuhive-{pid}-*"))


def test_killing_the_parent_takes_the_workers_and_the_next_start_reclaims():
    proc = subprocess.Popen([sys.executable, "-c", VICTIM], stdout=subprocess.PIPE,
                            text=True)
    try:
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert workers and all(_alive(p) for p in workers)
        assert proc.stdout.readline().strip() == "running"
        deadline = time.monotonic() + 30
        while not _ours(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # inside the timed repeats
        assert _ours(proc.pid), "the run made no shared buffers"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _gone(workers, within=5.0), "workers outlived their parent"
    left = _ours(proc.pid)
    assert left, "nothing to reclaim: the run cleaned up although killed"
    with CpuBackend(load_machine("local-cpu")) as backend:
        backend.start()
    assert not any(p.exists() for p in left)


def test_reclaim_leaves_live_owners_alone(tmp_path):
    mine = tmp_path / f"gpuhive-{os.getpid()}-live"
    mine.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    theirs = tmp_path / f"gpuhive-{dead.pid}-dead"
    theirs.mkdir()
    copy = tmp_path / f"gpuhive-copy-{dead.pid}.bin"
    copy.write_bytes(b"x")
    other = tmp_path / "unrelated-123"
    other.mkdir()
    removed = reclaim_orphans(str(tmp_path))
    assert sorted(removed) == sorted([str(theirs), str(copy)])
    assert mine.exists() and other.exists()
