"""Shared memory is a file system of its own size: a run's buffers go where
they fit, and a run whose buffers fit nowhere is refused in one line, never
killed by SIGBUS.

A container's ``/dev/shm`` is often 64 MB. Writing a mapped file past what
tmpfs holds kills the writer with SIGBUS: ``gpuhive run`` of a 240 MB task
ended with "Bus error" (exit 135), and a notebook's kernel would die the same
way (``make book`` in such a container, at its chapter M3).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from lib.contract import TaskSpec, decision_from_weights
from lib.execution import shm
from lib.execution.cpu import CpuBackend
from lib.execution.shm import SharedMemoryError, allocate, place
from lib.platform.machines import load_machine

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"),
                                reason="the cpu backend pins workers (Linux only)")


def test_buffers_go_where_they_fit_and_nowhere_is_refused_before_writing(
        tmp_path, monkeypatch):
    free = {"/dev/shm": 64_000_000, tempfile.gettempdir(): 10_000_000_000}
    monkeypatch.setattr(shm, "free_bytes", lambda root: free.get(root))
    if shm.shm_roots()[0] == "/dev/shm":
        assert place(63_000_000, "small") == "/dev/shm"
    assert place(240_000_000, "large") == tempfile.gettempdir()
    # a folder of the user's choice is the only one
    monkeypatch.setenv(shm.SHM_DIR_ENV, str(tmp_path))
    free[str(tmp_path)] = 64_000_000
    assert shm.shm_roots() == [str(tmp_path)]
    with pytest.raises(SharedMemoryError) as err:
        place(240_000_000, "cpu backend: elementwise[N=20000000] fp32")
    text = str(err.value)
    assert "needs 240 MB of shared memory, and 64 MB in " + str(tmp_path) in text
    assert "GPUHIVE_SHM_DIR" in text and "\n" not in text
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


def test_a_wrong_folder_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(shm.SHM_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(SharedMemoryError, match="missing: not a writable folder"):
        shm.shm_root()


#: In a mount namespace of its own, /dev/shm of 16 MB and, with an
#: argument, a 16 MB tmpfs at that folder (the run's TMPDIR), then a run of a
#: task of 48 MB.
SMALL_SHM = """
set -e
mount -t tmpfs -o size=16m tmpfs /dev/shm
if [ -n "$1" ]; then mount -t tmpfs -o size=16m tmpfs "$1"; fi
exec "$0" -m lib run --kind elementwise --dim N=4000000 --machine local-cpu \\
    --backend cpu --verify
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare here")
@pytest.mark.parametrize("tmp_too", [False, True])
def test_a_run_in_a_small_dev_shm(tmp_too, tmp_path):
    """The real thing: /dev/shm of 16 MB and a task of 48 MB runs with its
    buffers in the temp folder, saying so; with the temp folder as small, it
    is refused in one line, not ended by SIGBUS (exit 135)."""
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot make a mount namespace here (needs privileges)")
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "GPUHIVE_SHM_DIR": "", "TMPDIR": str(temp),
           "GPUHIVE_HOME": str(tmp_path / "home")}
    p = subprocess.run(["unshare", "-m", "sh", "-c", SMALL_SHM, sys.executable,
                        str(temp) if tmp_too else ""],
                       capture_output=True, text=True, timeout=120, env=env)
    if tmp_too:
        assert p.returncode == 1, (p.returncode, p.stderr)
        assert re.search(r"needs 48 MB of shared memory, and 1[67] MB in /dev/shm "
                         rf"and 1[67] MB in {re.escape(str(temp))} is free",
                         p.stderr), p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
    else:
        assert p.returncode == 0, (p.returncode, p.stderr)
        assert f"its buffers lay in {temp}: /dev/shm had no room" in p.stdout
        assert "verified true" in p.stdout
