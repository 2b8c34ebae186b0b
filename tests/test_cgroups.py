"""A container's limits are the process's: memory and CPU read from its
control group, not from the host's ``/proc/meminfo`` and CPU affinity.

In a memory cgroup of 300 MB on a computer with 24 GB free, ``gpuhive run
--kind elementwise --dim N=50000000 --backend cpu --verify`` passed the memory
check (``MemAvailable`` is the host's) and the kernel killed it (exit 137), as
it would kill a notebook's kernel on a JupyterHub or Binder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from lib.platform import hostinfo
from lib.platform.hostinfo import (
    available_memory_bytes,
    cgroup_memory_limit,
    cgroup_memory_room,
    cpu_quota,
)

MB = 1e6


def _tree(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[str, str]:
    """A /proc/self/cgroup and a /sys/fs/cgroup of ``files`` under tmp_path."""
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "self").write_text(proc)
    return str(tmp_path / "self"), str(root)


def test_cgroup_v2_limits_are_read_and_the_tightest_ancestor_wins(tmp_path):
    cg, root = _tree(tmp_path, "0::/user.slice/box\n", {
        "cgroup.controllers": "cpu memory",
        "memory.max": "max",
        "user.slice/memory.max": str(int(1000 * MB)),
        "user.slice/memory.current": str(int(900 * MB)),
        "user.slice/memory.stat": f"anon 1\ninactive_file {int(50 * MB)}\n",
        "user.slice/box/memory.max": str(int(500 * MB)),
        "user.slice/box/memory.current": str(int(100 * MB)),
        "user.slice/box/memory.stat": "inactive_file 0\n",
        "user.slice/cpu.max": "max 100000",
        "user.slice/box/cpu.max": "150000 100000",
    })
    # the box leaves 400 MB, its parent 1000 - 900 + 50 (droppable cache)
    assert cgroup_memory_room(cg, root) == pytest.approx(150 * MB)
    assert cgroup_memory_limit(cg, root) == pytest.approx(500 * MB)
    assert cpu_quota(cg, root) == pytest.approx(1.5)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 25000000 kB\nMemAvailable: 24000000 kB\n")
    assert available_memory_bytes(str(meminfo), cg, root) == pytest.approx(150 * MB)


def test_cgroup_v1_limits_and_no_limit(tmp_path):
    cg, root = _tree(tmp_path, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n", {
        "memory/memory.limit_in_bytes": "9223372036854771712",  # unlimited
        "memory/memory.usage_in_bytes": "1",
        "memory/docker/abc/memory.limit_in_bytes": str(int(2000 * MB)),
        "memory/docker/abc/memory.usage_in_bytes": str(int(500 * MB)),
        "memory/docker/abc/memory.stat": f"total_inactive_file {int(100 * MB)}\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "-1",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000",
    })
    assert cgroup_memory_room(cg, root) == pytest.approx(1600 * MB)
    assert cpu_quota(cg, root) is None                        # -1: no quota
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemAvailable: 1000000 kB\n")          # 1.024 GB: tighter
    assert available_memory_bytes(str(meminfo), cg, root) == pytest.approx(1.024e9)
    # a group the mount does not show (the host's path, seen from a
    # container) and no cgroups at all: no limit, nothing raised
    cg2, _ = _tree(tmp_path / "b", "4:memory:/elsewhere/x\n", {})
    assert cgroup_memory_room(cg2, root) is None
    assert cpu_quota(str(tmp_path / "missing"), root) is None
    assert available_memory_bytes(str(meminfo), str(tmp_path / "missing"),
                                  root) == pytest.approx(1.024e9)


def test_local_cpu_has_the_cores_its_quota_gives(monkeypatch):
    from lib.platform import machines
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores this process may run on")
    monkeypatch.setattr(machines, "cpu_quota", lambda: 1.5)
    m = machines.local_cpu_machine()
    assert m.n == 1 and "CPU quota of 1.5" in m.description
    monkeypatch.setattr(machines, "cpu_quota", lambda: None)
    assert machines.local_cpu_machine().n == min(8, len(os.sched_getaffinity(0)))
    monkeypatch.setattr(hostinfo, "cgroup_memory_limit", lambda: 300 * MB)
    assert hostinfo.host_memory_bytes() == pytest.approx(300 * MB)


def _writable_v1_memory() -> Path | None:
    base = Path("/sys/fs/cgroup/memory")
    if not (base / "memory.limit_in_bytes").is_file() or not os.access(base, os.W_OK):
        return None
    return base


@pytest.mark.skipif(_writable_v1_memory() is None,
                    reason="no writable cgroup v1 memory hierarchy here (needs root)")
def test_a_run_in_a_small_memory_cgroup_is_refused_not_killed():
    """The real thing: a 300 MB memory cgroup, a task of 600 MB."""
    group = _writable_v1_memory() / f"gpuhive-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(300 * 2**20))
        script = (f"echo $$ > {group}/cgroup.procs && exec \"$0\" -m lib run "
                  "--kind elementwise --dim N=50000000 --machine local-cpu "
                  "--backend cpu --verify")
        p = subprocess.run(["sh", "-c", script, sys.executable], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode in (1, 2), (p.returncode, p.stderr)   # not 137
        assert "GB free" in p.stderr or "GB available" in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
    finally:
        group.rmdir()
