"""What this computer's operating system says about it: memory and caches.

The ``local-cpu`` profile (:func:`lib.platform.machines.local_cpu_machine`)
is built from these readings; each returns a safe default, with the reason,
where the system does not say.

In a container (a JupyterHub's, a Binder's, a CI runner's) the computer's
figures are not this process's: ``/proc/meminfo`` and the CPU affinity show
the host, while the control group (cgroup) the container runs in holds the
process to a memory limit, past which the kernel kills it, and to a CPU quota.
:func:`available_memory_bytes` and :func:`cpu_quota` read both cgroup
versions, and the group's ancestors, for the tightest limit.
"""

from __future__ import annotations

import os


def last_level_cache(root: str = "/sys/devices/system/cpu/cpu0/cache"
                     ) -> tuple[float, str]:
    """The largest (last-level) cache of CPU 0 as the operating system
    reports it: ``(bytes, where it came from)``; ``(0.0, why not)`` where
    the system does not say (the cache term of the cost model is then off).
    """
    best, where = 0.0, f"not found under {root}: the cache term is off"
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return best, where
    for name in entries:
        if not name.startswith("index"):
            continue
        try:
            level = int(_read(f"{root}/{name}/level"))
            size = _read(f"{root}/{name}/size")
            kind = _read(f"{root}/{name}/type")
            shared = _read(f"{root}/{name}/shared_cpu_list")
        except (OSError, ValueError):
            continue
        unit = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(size[-1:].upper(), 1)
        try:
            nbytes = float(size.rstrip("KkMmGg")) * unit
        except ValueError:
            continue
        if kind != "Instruction" and nbytes > best:
            best = nbytes
            where = (f"read from {root}/{name}: level {level} {kind.lower()} "
                     f"cache of {size}, shared by CPUs {shared}")
    return best, where


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read().strip()


def host_memory_bytes() -> float:
    """This computer's physical memory, bytes, or its control group's memory
    limit where that is less (8 GiB where the OS does not say)."""
    try:
        total = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        total = 8.0 * 2**30
    limit = cgroup_memory_limit()
    return total if limit is None else min(total, limit)


def available_memory_bytes(meminfo: str = "/proc/meminfo",
                           cgroups: str = "/proc/self/cgroup",
                           root: str = "/sys/fs/cgroup") -> float | None:
    """Memory a new allocation can have without swapping, bytes: the
    computer's ``MemAvailable``, or what this process's control group leaves
    it where that is less (:func:`cgroup_memory_room`); None where neither
    says."""
    available = None
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = float(line.split()[1]) * 1024.0
                    break
    except OSError:
        pass
    room = cgroup_memory_room(cgroups, root)
    if room is None:
        return available
    return room if available is None else min(available, room)


#: A cgroup limit at or past this is no limit (v1 writes 2**63 rounded down
#: to a page for "unlimited").
NO_LIMIT = 2.0 ** 60


def _groups(controller: str, cgroups: str, root: str) -> list[str]:
    """The folders, innermost first, of this process's group for
    ``controller`` and of every group above it: cgroup v1's
    ``<root>/<controllers>/<path>`` where a hierarchy holds the controller,
    else v2's ``<root>/<path>`` (or ``<root>/unified/<path>``). Folders that
    the mount does not show (a path of the host's, seen from a container)
    are left out."""
    try:
        with open(cgroups) as fh:
            lines = [line.rstrip("\n").split(":", 2) for line in fh]
    except OSError:
        return []
    base = path = None
    for parts in lines:
        if len(parts) == 3 and controller in parts[1].split(","):
            for name in (parts[1], controller):
                if os.path.isdir(os.path.join(root, name)):
                    base, path = os.path.join(root, name), parts[2]
                    break
    if base is None:
        for parts in lines:
            if len(parts) == 3 and parts[0] == "0" and parts[1] == "":
                for name in ("", "unified"):
                    here = os.path.join(root, name)
                    if os.path.isfile(os.path.join(here, "cgroup.controllers")):
                        base, path = here, parts[2]
                        break
    if base is None:
        return []
    out, rel = [], (path or "/").strip("/")
    while True:
        folder = os.path.join(base, rel) if rel else base
        if os.path.isdir(folder):
            out.append(folder)
        if not rel:
            return out
        rel = os.path.dirname(rel)


def _number(path: str) -> float | None:
    try:
        text = _read(path)
    except OSError:
        return None
    try:
        return float(text)
    except ValueError:
        return None   # "max": no limit


def _stat(path: str, keys: tuple[str, ...]) -> float:
    try:
        with open(path) as fh:
            fields = dict(line.split()[:2] for line in fh if len(line.split()) >= 2)
    except OSError:
        return 0.0
    for key in keys:
        if key in fields:
            try:
                return float(fields[key])
            except ValueError:
                return 0.0
    return 0.0


def _memory_limits(cgroups: str, root: str) -> list[tuple[float, float]]:
    """(limit, room) of each group, this process's and those above it, that
    sets a memory limit: room is the limit less what the group uses, the page
    cache it can drop (inactive files) counted as room."""
    out = []
    for folder in _groups("memory", cgroups, root):
        limit = _number(os.path.join(folder, "memory.max"))
        if limit is not None:                                   # v2
            used = _number(os.path.join(folder, "memory.current"))
        else:                                                   # v1
            limit = _number(os.path.join(folder, "memory.limit_in_bytes"))
            used = _number(os.path.join(folder, "memory.usage_in_bytes"))
        if limit is None or limit >= NO_LIMIT or used is None:
            continue
        cache = _stat(os.path.join(folder, "memory.stat"),
                      ("inactive_file", "total_inactive_file"))
        out.append((limit, max(0.0, limit - used + cache)))
    return out


def cgroup_memory_room(cgroups: str = "/proc/self/cgroup",
                       root: str = "/sys/fs/cgroup") -> float | None:
    """Bytes this process's control group, and every group above it, let it
    allocate still (the tightest); None where no group limits it (or none
    can be read)."""
    rooms = [room for _, room in _memory_limits(cgroups, root)]
    return min(rooms) if rooms else None


def cgroup_memory_limit(cgroups: str = "/proc/self/cgroup",
                        root: str = "/sys/fs/cgroup") -> float | None:
    """The tightest memory limit of this process's control group and those
    above it, bytes; None where none sets one."""
    limits = [limit for limit, _ in _memory_limits(cgroups, root)]
    return min(limits) if limits else None


def cpu_quota(cgroups: str = "/proc/self/cgroup",
              root: str = "/sys/fs/cgroup") -> float | None:
    """The CPUs' worth of time this process's control group, and every group
    above it, may use (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``): the tightest; None where none sets a quota."""
    quota = None
    for folder in _groups("cpu", cgroups, root):
        try:
            text = _read(os.path.join(folder, "cpu.max")).split()
            share = None if text[0] == "max" else float(text[0]) / float(text[1])
        except (OSError, IndexError, ValueError):
            q = _number(os.path.join(folder, "cpu.cfs_quota_us"))
            period = _number(os.path.join(folder, "cpu.cfs_period_us"))
            share = q / period if q is not None and q > 0 and period else None
        if share is not None and share > 0:
            quota = share if quota is None else min(quota, share)
    return quota
