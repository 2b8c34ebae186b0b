"""Shared memory is a file system of its own size: a run whose buffers do not
fit in it is refused in one line, never killed by SIGBUS.

A container's ``/dev/shm`` is often 64 MB. Writing a mapped file past what
tmpfs holds kills the writer with SIGBUS: ``gpuhive run`` of a 240 MB task
ended with "Bus error" (exit 135), and a notebook's kernel would die the same
way.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys

import pytest

from lib.contract import TaskSpec, decision_from_weights
from lib.execution import shm
from lib.execution.cpu import CpuBackend
from lib.execution.shm import SharedMemoryError, allocate, check_room
from lib.platform.machines import load_machine

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"),
                                reason="the cpu backend pins workers (Linux only)")


def test_buffers_larger_than_the_folder_are_refused_before_anything_is_written(
        tmp_path, monkeypatch):
    monkeypatch.setenv(shm.SHM_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(shm, "free_bytes", lambda root: 64_000_000)
    check_room(63_000_000, "small")                          # fits: no error
    with pytest.raises(SharedMemoryError) as err:
        check_room(240_000_000, "cpu backend: elementwise[N=20000000] fp32")
    text = str(err.value)
    assert "240 MB of shared memory in " + str(tmp_path) in text
    assert "64 MB is free" in text and "GPUHIVE_SHM_DIR" in text
    assert "\n" not in text
    # the backend asks before it makes the inputs or starts a worker
    machine = load_machine("local-cpu")
    task = TaskSpec("elementwise", {"N": 20_000_000})
    decision = decision_from_weights(task, range(machine.n), [1.0] * machine.n)
    backend = CpuBackend(machine)
    try:
        with pytest.raises(SharedMemoryError, match="elementwise"):
            backend.run(task, decision.with_hash(task))
        assert not backend.workers and list(tmp_path.iterdir()) == []
    finally:
        backend.close()


def test_a_folder_that_fills_up_while_allocating_is_an_error_not_a_crash(
        tmp_path, monkeypatch):
    path = tmp_path / "x.bin"
    allocate(str(path), 1 << 20, "x")
    assert path.stat().st_size == 1 << 20 and path.stat().st_blocks * 512 >= 1 << 20

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(SharedMemoryError, match="input a needs 2 MB .* no room"):
        allocate(str(tmp_path / "y.bin"), 2 << 20, "input a")
    assert not (tmp_path / "y.bin").exists()       # nothing left half made

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    allocate(str(tmp_path / "z.bin"), 4096, "z")   # keeps its size, as before
    assert (tmp_path / "z.bin").stat().st_size == 4096


def test_the_folder_can_be_chosen_and_a_wrong_one_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(shm.SHM_DIR_ENV, str(tmp_path))
    assert shm.shm_root() == str(tmp_path)
    monkeypatch.setenv(shm.SHM_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(SharedMemoryError, match="missing: not a writable folder"):
        shm.shm_root()


#: Run in a mount namespace of its own whose /dev/shm holds 16 MB.
SMALL_SHM = """
set -e
mount -t tmpfs -o size=16m tmpfs /dev/shm
exec "$0" -m lib run --kind elementwise --dim N=4000000 --machine local-cpu \\
    --backend cpu
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare here")
def test_a_run_in_a_small_dev_shm_says_so_and_exits():
    """The real thing: /dev/shm of 16 MB, a task of 48 MB."""
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot make a mount namespace here (needs privileges)")
    p = subprocess.run(["unshare", "-m", "sh", "-c", SMALL_SHM, sys.executable],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "GPUHIVE_SHM_DIR": ""})
    assert p.returncode == 1, (p.returncode, p.stderr)    # not 135: SIGBUS
    assert "needs 48 MB of shared memory in /dev/shm" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
